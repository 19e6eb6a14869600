"""Looking at a converted dataset as a whole: which samples belong together (:mod:`.groups`) and splits that keep
groups whole and classes in every part (:mod:`.stratify`, ``shardkit split``)."""
