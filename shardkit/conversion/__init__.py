"""Conversion: from an input tree to published shards — options (:mod:`.config`), layouts (:mod:`.layouts`), the
pairs a split holds, input fingerprints, the plan (a pure function of the listing and the options), staging, the
worker and its pool (joblib or Dask), the pipeline that runs them, and the unchanged-nightly fast path.

Named ``conversion`` rather than ``convert`` so that :func:`shardkit.convert` stays the function."""
