"""Foundation: what every layer may use and nothing in shardkit is below — logging, optional extras, compiled
kernels, bounded reads of small files, string columns, progress bars, TOML. Imports nothing of shardkit but
:mod:`shardkit.errors` and :mod:`shardkit._version`."""
