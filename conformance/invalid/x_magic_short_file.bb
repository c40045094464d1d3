‰BBF
