# The words of the errno numbers files.reason() gives an OSError that carries only its
# number (some ports' do): T[errno], None where there are none. Imported only to word
# an error, through errors.message, and forgotten after (as the minimal runtime's
# generated microtrain/_msg_<module>.py tables are).
T = (
    None,  # 0
    'operation not permitted',  # 1
    'no such file or directory',  # 2
    None,  # 3
    None,  # 4
    'I/O error',  # 5
    None,  # 6
    None,  # 7
    None,  # 8
    'bad file descriptor',  # 9
    None,  # 10
    None,  # 11
    'out of memory',  # 12
    'permission denied',  # 13
    None,  # 14
    None,  # 15
    None,  # 16
    'file exists',  # 17
    None,  # 18
    None,  # 19
    'not a directory',  # 20
    'is a directory',  # 21
    'invalid argument',  # 22
    None,  # 23
    'too many open files',  # 24
    None,  # 25
    None,  # 26
    'file too large',  # 27
    'no space left on the device',  # 28
    None,  # 29
    'read-only filesystem',  # 30
    None,  # 31
    None,  # 32
    None,  # 33
    None,  # 34
    None,  # 35
    'file name too long',  # 36
    None,  # 37
    None,  # 38
    'directory not empty',  # 39
)
