"""A stand-in for the parts of vLLM 0.33.0 that the capture plugin touches, for tests on machines without
vLLM. Module paths, function names and signatures, local variable names, tensor layouts and op schemas
are those of the released wheel (see the line references); kernels are replaced by torch code with the
same contract (compressed logits with garbage past each row's end, a padded row stride, -1 tails).
Placed on sys.path only inside the tests that use it."""

__version__ = "0.33.0"
