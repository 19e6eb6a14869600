"""Annotation sources: datasets whose labels are shapes in a file (COCO instances JSON, labelme JSON), not one
mask image per sample. One module per source, found by :mod:`.registry`; the contract is :mod:`.base`."""
