"""The ``wattline`` command (floor 4): each command parses, then calls one function."""
