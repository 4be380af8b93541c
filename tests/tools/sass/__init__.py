"""Static rules on the CUDA kernels' machine code, checked without a GPU
(`.ci/sass_check`): parse.py reads ptxas / nvdisasm text, rules.py holds the
rules and the exemption table, check.py compiles, reports and decides."""
