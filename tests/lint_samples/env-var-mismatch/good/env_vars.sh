# Settings of the run, read by train.py
export EXPERIMENT_NAME="weak_scaling_2_gpus"
export MODEL_NAME="bigscience/bloom-560m"
export PER_DEVICE_BATCH_SIZE=8
export GRAD_ACC_STEPS=2
export LEARNING_RATE=5e-5
