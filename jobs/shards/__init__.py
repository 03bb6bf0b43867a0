"""Tree shards, the one home of what a finished tree becomes on its way to storage:

- `table`: a finished tree as a shard table (one row per node, canonical node order);
- `batcher`: finished trees committed a batch at a time, several to a data file;
- `storage`: a sweep's shards on a store: the key layout, the Parquet schema, the commit protocol
  (each tree committed by its own put-if-absent marker) and the reads that verify it.
"""
