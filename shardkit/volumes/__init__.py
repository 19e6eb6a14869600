"""3-D volumes (NIfTI) read under bounds and cut into 2-D / 2.5-D slice samples that stitch back exactly
(docs/volumes.md)."""
