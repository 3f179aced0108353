"""Reports and job lists for people and files: terminal tables (:mod:`.render`,
:mod:`.jobs_table`, :mod:`.comparison`), HTML (:mod:`.page`), plots (:mod:`.plot`), CSV and
Parquet (:mod:`.export`), and how figures read (:mod:`.quantities`, :mod:`.labels`)."""
