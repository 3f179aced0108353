"""Storage back-ends behind one small interface (:class:`~.base.Store`), one package each:
:mod:`.sqlite`, :mod:`.influxdb`, :mod:`.victoria`, :mod:`.prometheus` (and :mod:`.series`,
the Prometheus data model the last two share). Beside them what they all use: the schema
(:mod:`.schema`), the one point encoder (:mod:`.lineprotocol`), the reader interface
(:mod:`.reader`) and the URL that picks one (:mod:`.factory`)."""
