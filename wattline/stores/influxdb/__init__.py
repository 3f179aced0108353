"""InfluxDB 1.x and 2.x: line protocol (the one encoder), the HTTP client, writes and InfluxQL reads."""
