"""A stand-in for the seeds' FSDP scripts: settings come from the environment."""
import os

MODEL_NAME = os.getenv("MODEL_NAME", "bigscience/bloom-560m")
RUN_NAME = os.environ.get("RUN_NAME", "default")
BATCH_SIZE = int(os.getenv("PER_DEVICE_BATCH_SIZE", 1))
GRAD_ACC_STEPS = int(os.getenv("GRAD_ACC_STEPS", 1))
LR = float(os.environ["LEARNING_RATE"])
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))
print(MODEL_NAME, RUN_NAME, BATCH_SIZE, GRAD_ACC_STEPS, LR, LOCAL_RANK)
