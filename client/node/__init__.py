"""A data owner's node: its privacy policy, data shard, state directory and ledger, the SDK and
``fedlora node``."""
