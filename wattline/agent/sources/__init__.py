"""Energy sources, one module each, behind :class:`~.base.Source`."""
