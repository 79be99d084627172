# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 4: Fully Sharded Data Parallel (FSDP)
#
# This chapter is being written. Until it lands, the pages under *Before you start* explain the
# cluster side, and {doc}`../book/answers` collects the questions this chapter will ask.
