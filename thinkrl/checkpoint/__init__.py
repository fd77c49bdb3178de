"""Checkpoints: atomic saves that resume a run exactly, and export to Hugging Face.

`store` handles folders on disk, `state` what a checkpoint holds, `resume`
which one a run starts from, `export` the Hugging Face folder of a trained actor.
"""
