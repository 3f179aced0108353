"""The PromQL twins of wattline's InfluxQL dashboards, a module per dashboard (:mod:`.fleet`,
:mod:`.host`, :mod:`.jobs`, :mod:`.services`), built of :mod:`.pieces` into :mod:`.twins`;
``grafana/generate.py`` swaps them in.

The queries read what the collector writes to VictoriaMetrics and, by Prometheus remote
write, to Prometheus, Mimir and Thanos (wattline/stores/series/points.py, one
layout): a line-protocol field is the metric ``<measurement>_<field>``, so a sample's energy is
``energy_energy_j`` and every point has ``<measurement>_sub_ns``.

One flavour for every engine: standard PromQL as Prometheus 2.33 and later evaluate it (the
``@`` modifier and negative offsets are stable there), no MetricsQL function:

- a raw sample's time is ``timestamp()`` of its selector, taken at the steps of a subquery
  (:func:`.pieces.stamp`); exact for a job event's open, phase and close (a series of one sample each),
  and for ranking an agent's streams by their newest sample;
- a channel's last failure is the end of the step (``$__interval``) that holds it, not the
  failing sample's own time (PromQL has no ``tmin_over_time``);
- "Units completed" is each step's units over the range's length before it, not a running
  sum from the range's first step (PromQL has no ``running_sum``): in a range that starts
  before the job, as its table links open it, that is the job's running total;
- a job summary is one series per job whose newest sample is its newest rewrite (#45), read
  through :func:`.jobs.summary`, which also takes the newest of the several series a job may hold
  from before #45 (its status was a label then); and a summary is taken from the job's start,
  as the summary's ``start_ns`` field says, not from its sample's time stamp (every engine
  stamps a summary when it is written, after the job's start).
"""
