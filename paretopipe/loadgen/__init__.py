"""MLPerf-style load on a split pipeline: MLCommons LoadGen (``mlperf_loadgen``) drives the whole
pipeline as its system under test from the data source, in its SingleStream, MultiStream, Offline
and Server scenarios.

- :mod:`.settings`: the scenario's options as one typed object, with the edge rules' durations
  (``--mlperf-compliant``) and LoadGen's ``TestSettings`` made from them;
- :mod:`.logs`: LoadGen's ``mlperf_log_summary.txt`` read into the record's figures;
- :mod:`.server_search`: the highest Poisson rate whose 99th percentile stays within a bound;
- :mod:`.queueing`: that rate predicted from the cost model's service times.

These are torch-free and below the transport; the harness that runs LoadGen over a pipeline is
``paretopipe.transport.sut``. ``mlperf_loadgen`` is loaded only by a run that uses it.
"""
