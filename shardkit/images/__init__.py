"""Core, pixels from files: decoding (:mod:`.imageio`), dtypes and bands (:mod:`.imagetypes`), offline
preprocessing with labels nearest only (:mod:`.preprocess`) and tiling with provenance and stitching (:mod:`.tiles`)."""
