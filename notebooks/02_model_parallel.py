# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 2: Model parallel fine-tuning (tensor, expert and sequence parallelism)
#
# This chapter is being written. Until it lands, the pages under *Before you start* explain the
# cluster side, and {doc}`../book/answers` collects the questions this chapter will ask.
