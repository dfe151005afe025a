"""Mutation kill tests for packer/dataset.py and the torch sampler/reader state of packer/torch.py.

Written after the declared fields (SPEC §14) landed: each pins down behaviour that a surviving
mutant of `scripts/mutate.py` changed. `tests/test_mutation_kills.py` holds the ones from before.
"""
