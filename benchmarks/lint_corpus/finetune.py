print('stub: the corpus is linted, never run')
