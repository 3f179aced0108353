"""What runs beside a job: the Job API (:mod:`.job`), ``wattline run`` (:mod:`.run`,
:mod:`.job_command`), the session to a collector or the embedded store (:mod:`.session`,
:mod:`.embedded`), heartbeats and holding (:mod:`.heartbeat`, :mod:`.holding`), device use
(:mod:`.usage`, :mod:`.processes`), the live line (:mod:`.live`), the sync barrier
(:mod:`.sync`) and the Slurm prolog/epilog (:mod:`.slurm`)."""
