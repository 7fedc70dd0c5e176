class InputContainer:  # import stub
    pass


class OutputContainer:  # import stub
    pass
