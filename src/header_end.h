#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TORCH_BACKEND_H */
