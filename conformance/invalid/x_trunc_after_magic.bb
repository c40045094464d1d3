‰BBF

