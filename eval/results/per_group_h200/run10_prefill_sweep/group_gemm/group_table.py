GROUP_TABLES: dict = {
    'NVIDIA H200': {
        'prefill@6144x2048': {'BM': 64, 'BN': 128, 'BK': 128, 'GROUP_M': 8, 'num_warps': 4, 'num_stages': 3},
        'prefill@2048x2048': {'BM': 128, 'BN': 128, 'BK': 128, 'GROUP_M': 8, 'num_warps': 8, 'num_stages': 3},
        'prefill@11264x2048': {'BM': 64, 'BN': 128, 'BK': 128, 'GROUP_M': 8, 'num_warps': 4, 'num_stages': 3},
        'prefill@2048x5632': {'BM': 128, 'BN': 128, 'BK': 128, 'GROUP_M': 8, 'num_warps': 8, 'num_stages': 3},
    },
}
