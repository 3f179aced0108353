"""The per-host agent: sources -> counter -> sampler -> spool -> uplink (floor 2).

Imports only the core (``wattline.*`` floor 1), never the collector.
"""
