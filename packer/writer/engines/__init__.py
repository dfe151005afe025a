"""Engines that run the packing of planned shards: a local process pool, or Ray tasks."""
