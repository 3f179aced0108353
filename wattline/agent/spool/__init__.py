"""Batches and job events kept until a collector acknowledged them: in memory, on disk, and the outbox."""
