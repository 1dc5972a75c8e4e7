"""MLCommons LoadGen's system under test (SUT, LoadGen's own word for what answers its queries)
at the data source: its queries as the pipeline's batches (:mod:`.feed`),
and one test or a Server search over a running pipeline (:mod:`.harness`). The settings, the
logs' figures, the search's rule and the queueing bound are torch-free, in ``paretopipe.loadgen``."""
