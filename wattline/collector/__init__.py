"""The collector: gRPC ingest -> stores (floor 2). Never imports the agent."""
