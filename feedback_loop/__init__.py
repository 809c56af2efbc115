"""The feedback loop: the joiner (predictions ⋈ late labels, a PyFlink job), versioned training snapshots, the skew and
consistency monitor (faust-streaming) and the retrain trigger."""
