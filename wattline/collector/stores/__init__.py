"""Storage back-ends behind one small interface (:class:`~.base.Store`)."""
