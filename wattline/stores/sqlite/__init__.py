"""The embedded SQLite store: its file's schema, its writes and its reads."""
