"""The agent session: admission, materialisation, the durable ledger, transactions, the registry."""
