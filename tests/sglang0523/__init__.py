"""A stand-in SGLang 0.5.23 tree (`sglang`, `sgl_kernel`) for the capture plugin's tests: the real module paths,
class, function and local names and signatures of the DSA indexer's top-k call site, read from the 0.5.23
wheel, with torch bodies that run on CPU (and CUDA). Only what the call site touches is here."""
