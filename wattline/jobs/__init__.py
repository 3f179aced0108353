"""Jobs as the store holds them: the events a wrapper writes (:mod:`.events`, :mod:`.job_env`)
and a job's view built from them (:mod:`.jobs_view`)."""
