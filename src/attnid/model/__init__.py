"""The model and its orbit geometry: the nanoGPT-compatible GPT (:mod:`.gpt`), how its attention tensors
are cut into factor pairs and which orbit each circuit has (:mod:`.layout`), and moves of a whole model
along its orbit (:mod:`.moves`), and the memory a model needs to train or evaluate (:mod:`.footprint`). May
import: ``theory``, ``common``."""
