"""Services over the store: job summaries kept as jobs close (:mod:`.summary`) and the reading
behind ``report``, ``jobs`` and ``compare`` (:mod:`.reading`)."""
