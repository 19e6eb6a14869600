"""Core, the files of a split folder: the typed parts and safe names (:mod:`.splitfiles`), the per-sample sidecars
(:mod:`.samples`), object storage through fsspec (:mod:`.storage`) and locks and leases (:mod:`.lock`). Below the
formats, which write and read these; the manifest and publishing that put them together: :mod:`shardkit.store`."""
