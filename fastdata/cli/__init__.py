"""The command-line tools, thin over the library: fastdata-convert (convert.py),
fastdata-doctor (doctor.py), fastdata-bench (bench.py with its contenders and report),
and the demo image set they share (demo.py)."""
