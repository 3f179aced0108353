"""A job's report: built from the store (:mod:`.build`, with :mod:`.channels`, :mod:`.idle`,
:mod:`.timeline`, :mod:`.carbon`), what it holds (:mod:`.model`), its figures
(:mod:`.economics`, :mod:`.spans`) and its JSON (:mod:`.report_json`)."""
