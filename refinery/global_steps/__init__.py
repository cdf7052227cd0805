"""The global steps: work over the whole corpus at once, not one document at a time, each a
library function that an asset (or a Ray/task driver) runs over the data root.

dedup_compute.py runs the two dedup passes over every input shard: exact_dedup.py (content hashes
in hash ranges) and near_dedup.py (MinHash signatures from minhash.py, LSH bands, clusters);
tokenize.py trains the tokenizer and encodes the clean documents into token shards (scoring each
with refinery.models.difficulty when it is enabled); shuffle.py shuffles each bucket's shards.
They stand on refinery.stages (stats, base, attribute tables) and refinery.models, never the
other way round (tests/test_architecture.py).
"""
