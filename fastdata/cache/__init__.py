"""The LMDB cache: its on-disk format (format.py) and the file checks made before LMDB maps
it (lmdb_file.py), shared by the reader (fastdata.sources.lmdb) and the writer behind
fastdata-convert (fastdata.cache.build)."""
