"""The job the images exist for: `generate` (the completions run against one server per GPU:
sampled, thinking on, batched, resumable) and `throughput` (its measure: output tokens/s per
server at the job's shape). The consumer runs them on its own host; the smoke's throughput and
workload levels run them against the image under test, so this part sits below the stages and
the consumer side and imports neither."""
