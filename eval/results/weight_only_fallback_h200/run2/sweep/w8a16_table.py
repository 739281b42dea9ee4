TABLES['NVIDIA H200'] = {
    '1@2048x4096': {'BM': 16, 'BN': 32, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '16@2048x4096': {'BM': 16, 'BN': 32, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '32@2048x4096': {'BM': 32, 'BN': 64, 'BK': 256, 'SPLIT_K': 8, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '64@2048x4096': {'BM': 64, 'BN': 64, 'BK': 256, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 8, 'num_stages': 3},
    '128@2048x4096': {'BM': 64, 'BN': 64, 'BK': 256, 'SPLIT_K': 2, 'FIXUP': True, 'num_warps': 8, 'num_stages': 3},
    '256@2048x4096': {'BM': 64, 'BN': 64, 'BK': 128, 'SPLIT_K': 2, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '1@2048x5632': {'BM': 16, 'BN': 32, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '16@2048x5632': {'BM': 16, 'BN': 32, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '32@2048x5632': {'BM': 32, 'BN': 64, 'BK': 256, 'SPLIT_K': 8, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '64@2048x5632': {'BM': 64, 'BN': 64, 'BK': 256, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 8, 'num_stages': 3},
    '128@2048x5632': {'BM': 64, 'BN': 64, 'BK': 128, 'SPLIT_K': 4, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
    '256@2048x5632': {'BM': 64, 'BN': 64, 'BK': 128, 'SPLIT_K': 2, 'FIXUP': True, 'num_warps': 4, 'num_stages': 4},
}
