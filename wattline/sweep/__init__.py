"""``wattline sweep``: a grid of settings, each point run as a job (``wattline run``'s
machinery) several times in an interleaved order, and the answer: the points ranked by
energy per unit, the Pareto front against throughput, and which advantages are real.

- :mod:`.grid`: the parameters, the grid, the order of the runs, the command of a point;
- :mod:`.plan`: a sweep's plan on disk (what ``--resume`` reads);
- :mod:`.runner`: runs the plan's jobs, applying the settings wattline applies itself;
- :mod:`.analysis`: the figures, the Pareto front and the significance rule (pure);
- :mod:`.output`: the table, JSON and CSV; :mod:`.figure`: the Pareto figure and the page.
"""
