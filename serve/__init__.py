"""The inference server: `serve` answers SageMaker's hosting contract for the trained model.

Modules, in the order a request meets them:
  config      settings from SageMaker's environment variables (a frozen dataclass)
  server      gunicorn: processes, threads, signals, a socket per worker (imports no Flask)
  intake      a request gets a thread once it has all arrived, or is cut at its deadline
  host        the host's cores and GPUs: how many workers, TensorFlow's threads per worker
  worker      one worker's app, model and batcher, built after fork
  app         the Flask routes and the one mapping from exceptions to HTTP answers
  codecs      request bodies -> arrays, outputs -> response bodies, Accept negotiation
  validation  instance shape and finiteness, checked per request
  limits      the decode budget: how many bytes of bodies a worker decodes at once
  batching    the micro-batcher that lets concurrent requests share a model call
  signature   the model's named inputs and outputs, as requests are checked against them
  model       finding, loading, warm-up and the forward pass (the only module importing
              TensorFlow)
  metadata    the model directory's metadata.json, written by the trainer, read here
  errors      request errors, each with its HTTP status
  logs        JSON log lines
"""
