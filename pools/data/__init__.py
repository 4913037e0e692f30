"""Data files shipped with pools (the tiny model's tokenizer corpus); a package for wheels."""
