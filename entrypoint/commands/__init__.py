"""The `rentune` subcommands, one module each; entrypoint/cli.py registers them on the click group `main`.

This is where rentune's argv is parsed (click). The processes the runner starts (entrypoint/processes/:
a torchrun rank, the verify phase's recheck) parse only the store flags `runner.store_args` gives them
(entrypoint/context.py, `subprocess_context`).

    validate, schema, plan         a spec, read here; no store
    run                            the job's phases on this node (store: --store, else the spec's store.uri)
    submit, worker                 the remote queue in the bucket
    status, logs, fetch            a job's state, logs and report, read from the bucket
    check-export                   an export against its BINDING.json and a base model (alias: verify-export)
    push-model, convert-gguf       a base model into a bucket, a GGUF file into safetensors
    env                            the backend and versions a job would record

Every command that takes a store takes the same options (options.py, `store_options`); every error that
ends a command goes through exits.py (`exits`), which maps it to its exit code (entrypoint/errors.py).
`validate`, `plan`, `schema`, `status`, `logs` and `submit` import neither torch nor transformers (heavy
imports stay inside the commands that need them; tests/unit/test_light_commands.py checks it).

The environment variables rentune reads, and where:

    RENTUNE_STORE                  --store of every command that takes a store but `run` (options.py)
    RENTUNE_NODE_RANK              `run --node-rank` (run.py)
    RENTUNE_S3_ADDRESSING_STYLE    addressing style when neither the spec nor a flag sets one (store/s3.py)
    AWS_REGION, AWS_MAX_ATTEMPTS, AWS_REQUEST_CHECKSUM_CALCULATION, AWS_RESPONSE_CHECKSUM_VALIDATION
                                   S3 client settings (store/s3.py); boto3 itself reads the rest
                                   (credentials, AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3)
    RENTUNE_MODEL_CACHE            where models pulled from a bucket are kept (store/models.py)
    RENTUNE_TOKENIZE_PROCESSES     tokenizer processes (data/tokens.py)
    RENTUNE_PEAK_TFLOPS            the device's peak, for MFU (training/throughput.py)
    RENTUNE_RDZV_ENDPOINT, MASTER_ADDR, MASTER_PORT
                                   the multi-node rendezvous (training/distributed.py)
    LOCAL_RANK, RANK, GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE
                                   set by torchrun for the training ranks (training/distributed.py,
                                   training/trainer.py)
    RENTUNE_IMAGE_DIGEST, RENTUNE_LOCK_FILE
                                   the image and its dependency lock, recorded with each attempt's
                                   environment (training/environment.py)
    RENTUNE_INTERRUPTION_NOTICE, RENTUNE_METADATA_URL, RENTUNE_NOTICE_POLL_SECONDS
                                   a cloud provider's interruption notices, polled beside the job (notices.py)
    WANDB_DIR                      the W&B run folder (tracking/wandb_runs.py); W&B and MLflow read their own
                                   variables (WANDB_API_KEY, WANDB_MODE, MLFLOW_TRACKING_URI, credentials)
    HF_HUB_OFFLINE, HF_HUB_CACHE   through huggingface_hub, for hub models (training/model.py)

rentune sets, when unset: MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_TIMEOUT (cli.py),
TOKENIZERS_PARALLELISM (data/tokens.py); and TORCH_ELASTIC_SHUTDOWN_TIMEOUT for torchrun
(training/distributed.py).
"""
