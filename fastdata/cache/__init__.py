"""What fastdata-convert writes: the LMDB cache's on-disk format (format.py), shared by the
writer (fastdata-convert) and the reader (fastdata.sources.lmdb), and WebDataset tar shards
with their index (shard_writer.py, read by fastdata.sources.tar_shards)."""
