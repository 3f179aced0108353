"""The collector: gRPC ingest -> stores (floor 3, above the stores). Never imports the agent."""
