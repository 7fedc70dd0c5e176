class SubtitleStream:  # import stub
    pass
