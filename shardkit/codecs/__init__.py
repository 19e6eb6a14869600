"""Core, how arrays become bytes and back: the per-array codecs and their registry (:mod:`.registry`), the label
encodings ``index``/``onehot``/``packed`` (:mod:`.encoding`) and the vectorised one-hot kernel (:mod:`.onehot`)."""
