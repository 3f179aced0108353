"""Each job's use of the host: its processes' CPU time and device use, as USE periods."""
