"""Training code for TokenSwift Live's small default model.

Sub-modules:

* :mod:`tokenswift.train.corpus` -- loads the shared plain-text corpus and applies its train/val split.
* :mod:`tokenswift.train.tokenizer` -- trains the byte-level BPE tokenizer on the train split.
* :mod:`tokenswift.train.lm` -- trains the Llama base language model (checkpoints, resume, validation).

Run ``python -m tokenswift.train --help`` for the command line.
"""
